"""The demo: a small support-desk business system and the agents that exercise the guard on it.

Installed by default so that a first run shows every scenario against real records
(orders, refunds, notices, export jobs, pages). Nothing in the product depends on it: the
console finds these agents through ``LOOPGUARD_AGENTS`` like any other.
"""
