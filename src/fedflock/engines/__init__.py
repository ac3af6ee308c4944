"""Engines move tasks to clients and replies back; they hold no algorithm logic."""
