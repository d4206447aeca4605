"""The tianji-cni plugin: containers in tenant VPCs (see main.py)."""
