"""The CLI's command handlers, one module per command group (``plans``, ``runs``, ``state``);
``sparkguard.cli`` builds the parser, dispatches to them and maps errors to exit codes."""
