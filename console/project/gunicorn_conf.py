"""gunicorn's settings for the console (``gunicorn -c python:console.project.gunicorn_conf``).

Only logging lives here: gunicorn's own lines (start-up, workers, one access line per
request) come out in LoopGuard's one-line format (console/records/logs.py), like Django's and
Celery's. Bind address, workers and timeouts are given on the command line.
"""

import os

from console.records.logs import logging_config

logconfig_dict = logging_config(os.environ.get("DJANGO_LOG_LEVEL", "").strip() or "INFO")
# Client, request line, status, bytes, duration.
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms'
# gunicorn 24+ opens a control socket under $HOME by default; the console does not use it,
# and two servers on one machine would contend for the same path.
control_socket_disable = True
