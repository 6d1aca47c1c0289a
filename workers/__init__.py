"""The orga-queue workers: execute ORGA iterations and tool calls."""
