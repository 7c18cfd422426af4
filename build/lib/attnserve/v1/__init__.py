"""Generated from attnserve/v1/*.proto by protos/generate.py."""
