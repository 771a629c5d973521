"""egbert's model families; importing this registers them with transformers' Auto classes.

The saved folders load without egbert too, in the Hub's layout for code that comes with a model:
each config class is also registered for saving (`register_for_auto_class`), so that its
save_pretrained, which every model's save_pretrained calls, copies the file defining it and the
files that file imports relatively into the folder (every model's save adds heads.py, the
sequence classifier's file), and each model's save_pretrained names the classes the folder loads
as in config.json's `auto_map`, its family's sequence classifier among them, so that
transformers fine-tunes any folder through AutoModelForSequenceClassification. A
Python without egbert then loads the folder through the Auto classes by running those copies,
where the user opts in to running a folder's code; with egbert imported, transformers uses the
classes registered here and runs none of it. The model classes are not registered for saving:
under FSDP2 a model's class is one torch derives at run time, and transformers would copy torch's
files and name that class. The copies do not register themselves, so each folder loaded without
egbert runs its own code.
"""

import transformers
from transformers import AutoConfig, AutoModelForSequenceClassification

from . import bert, elmo, gpt, heads


def register(auto_classes: dict[str, type]) -> None:
    """Register a family's classes with the Auto classes its AUTO_CLASSES table names."""
    config_class = auto_classes["AutoConfig"]
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    config_class.register_for_auto_class()  # its save_pretrained copies the family's files
    for name, model_class in auto_classes.items():
        if name != "AutoConfig":
            getattr(transformers, name).register(config_class, model_class, exist_ok=True)


for family in (bert, gpt, elmo):
    register(family.AUTO_CLASSES)
for classifier in heads.CLASSIFIERS:
    AutoModelForSequenceClassification.register(classifier.config_class, classifier, exist_ok=True)
