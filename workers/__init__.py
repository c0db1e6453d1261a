"""Life inside a prefork server (built by a later issue; see DESIGN.md, "The rooms")."""
