// Placeholder for a part that has no sources yet.
