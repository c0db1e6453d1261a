"""The host's discovery process (built by a later issue; see DESIGN.md, "The rooms")."""
