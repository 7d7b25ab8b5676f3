"""Tasks: what a job optimises and how it is evaluated."""
