"""The one place the stages meet: the engine, replay and watch drivers, the watch cursor and metrics."""
