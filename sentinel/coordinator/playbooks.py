"""Where `sentinel.demo` finds the playbooks (`core/playbooks.py`) until it imports them there."""

from sentinel.coordinator.core.playbooks import Playbook, default_playbooks_dir, load_playbooks

__all__ = ["Playbook", "default_playbooks_dir", "load_playbooks"]
