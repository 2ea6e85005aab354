"""Views: pure functions from runs to HTML, text, figures and files. Nothing here runs a model."""
