"""What the package knows of model files, below the pass: :mod:`.read` (reading and checking them), :mod:`.write`
(saving them durably, and the guards before), :mod:`.graphs` (the one walk over a model's graphs), :mod:`.types`
(types and shapes of its values) and :mod:`.shapes` (ONNX's inference on a proto, with the dims it leaves unknown
put back). Import from the modules: this face hands nothing on."""
