"""The tests are one package (``tests``, with a package per folder): a test file or helper is
imported by its full name (``tests.coordinator.coordinator_testing``), so no test folder
shadows the source package of the same name (``tests/coordinator`` and ``coordinator``), and
plain ``pytest`` and ``python -m pytest`` import the same modules."""
