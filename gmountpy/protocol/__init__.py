"""How nodes and clients talk: frames (wire), authenticated connections (rpc, tls), the typed
messages, and the client every caller of a daemon uses."""
