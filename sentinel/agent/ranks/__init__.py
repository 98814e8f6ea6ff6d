"""The training ranks on this node: their local socket and which GPU each one owns."""
