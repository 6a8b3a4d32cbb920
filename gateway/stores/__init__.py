"""Storage adapters behind the store interfaces of the domain."""
