"""The JSON API: its URL map, views, serializers, OpenAPI description and tokens."""
