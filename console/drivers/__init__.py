"""What drives a task: the hosted runner, the attached driver, the guard's Ledger over the
store, the trace events both write, the notices' outbox and delivery."""
