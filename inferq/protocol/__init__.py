"""The Redis protocol, each rule in one place: key names (``keys``), the names stored inside a
request's keys (``fields``), the Lua scripts (``lua/``, loaded by ``scripts``) and their
arguments and replies (``ops``), score encoding (``scores``), a request's cost, the one token
estimate (``cost``) and the reference model of fair shares (``fair``), the wire codec and the
one definition of a result (``codec.Result``)."""
