"""Ownership of connections: who may deliver a connection, under which epoch, until when."""
