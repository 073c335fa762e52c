"""Every SQL statement of the coordinator: the interface, SQLite, migrations."""
