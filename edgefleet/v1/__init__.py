"""Generated protobuf code; see protos/generate.py."""
