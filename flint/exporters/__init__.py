"""Writers of workload graphs and predictions to other tools' formats."""
