"""The browser console: who may see and do what, and how every page holds up.

Each test signs in one of a handful of personas (one person per role, plus someone signed
in with no role at all) and drives the console through Django's test client against the
real PostgreSQL database, the way a person in a browser would: read a page, take the form
and its CSRF token from it, post it, follow the redirect, read the message.
"""
