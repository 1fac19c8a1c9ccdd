"""What every role shares below the wire: its event loop, sockets and endpoints, CURVE security, the
compiled twins' loader, the FETCH-answer budget, and giving memory back."""
