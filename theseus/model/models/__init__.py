"""Full models, the options of the ``model`` group (declared in ``theseus.options``)."""
