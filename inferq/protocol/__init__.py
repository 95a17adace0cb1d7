"""The Redis protocol: key names, Lua scripts, score encoding and the wire codec."""
