"""One module per `sentinel` subcommand: argument parsing and a handler, nothing heavy at import."""
