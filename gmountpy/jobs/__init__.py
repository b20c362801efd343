"""Running jobs where their data is: the placement rule and starting commands on a node."""
