"""kvgate simulator package."""
