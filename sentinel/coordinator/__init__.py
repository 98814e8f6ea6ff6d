"""The coordinator: the control plane (store, incidents, playbooks, engine, HTTP API).

Never imports torch.
"""
