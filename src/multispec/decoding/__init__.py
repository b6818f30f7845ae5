"""Decoding: the method registry (`methods`), the round loop (`engine`), its metrics record (`metrics`) and the
`Decoder` that ties them to a loaded pair (`decoder`). Importing this package loads nothing heavy: `methods` is
read by the CLI before torch is imported."""
