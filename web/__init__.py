"""Static files of the browser UI, shipped as package data."""
