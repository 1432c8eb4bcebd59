"""The pages: views, forms, the notifications page, the dashboard's charts, /healthz and
/metrics."""
