"""The shared trainer: config, data, tasks, parallel strategies, tracking."""
