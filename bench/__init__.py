"""kvgate bench package."""
