"""Trained predictors read at run time by adaptive drafting: the SpecDec++ acceptance head (`acceptance`) and P1's
decision models (`decision`). Their data generation and training live in `multispec.training`."""
