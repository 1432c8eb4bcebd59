"""The support desk: a small business system of its own that the demo agents act on.

Orders, refunds, customer notices, export jobs and a paged dataset live in their own
tables, so that an operation the guard marks ``UNKNOWN`` can be reconciled against real
records (``refund_find`` / ``notice_find`` by idempotency key) rather than guessed at.
"""
