"""The ground floor: errors, where files live, options, the shared limits, dtype tables, spans and the tree layout's arithmetic. Imports nothing of peers."""
