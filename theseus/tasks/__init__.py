"""Tasks: what a job optimises (``task=NAME``); importing this package registers theseus's own."""
