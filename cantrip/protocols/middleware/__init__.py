"""What wraps every route: the guard, limits, the lifecycle (drain), client faults."""
