"""HTTP routes: ``openai_compat`` (OpenAI-shaped), ``native`` (inferq's request API),
``health`` (probes, no auth)."""
