"""The controller: read → decide → apply per CompileCache, when, and deletion; the operator's memory; the only
writer of a CompileCache's status. Imports the model, the decisions, the edge and this package."""
