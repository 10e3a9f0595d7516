"""Frames over streams: channels, the handshake, TLS, dialling, the relay, link shaping and the control protocol."""
