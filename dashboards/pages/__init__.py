"""One module per dashboard page; each registers itself with ``dash.register_page``."""
