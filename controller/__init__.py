"""Tianji central controller: tenant REST API, persistent state, host watch API."""
