"""The ground floor: settings, ids, hashing, errors, vocabulary, schema, engines, dialect and
migrations. It imports nothing else of the project; every other package stands on it."""
