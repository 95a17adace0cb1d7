"""The producer SDK: light (redis, msgpack, pydantic), never imports torch."""
