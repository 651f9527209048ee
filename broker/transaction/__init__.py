"""Transactional (half) messages: the pure state, the store bridge, END_TRANSACTION and the check service."""
