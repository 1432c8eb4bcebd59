"""The console's values and records beside the models: redaction, input checks, roles, logs,
model prices and money."""
