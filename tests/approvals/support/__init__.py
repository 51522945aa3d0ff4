"""Helpers shared by the approvals tests: HTML inspections and the browser pages."""
