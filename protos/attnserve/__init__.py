"""attnserve's protobuf API (generated code in attnserve.v1)."""
