"""The recipes/ folder: data sets with known answers, models, configs."""
