"""Full models; importing this package registers them as options of the ``model`` group."""
