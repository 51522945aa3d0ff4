"""Helpers shared by the agentruns tests (runs in each state, races, crashes, leases, the ledger).
Test modules import from here, never from one another."""
