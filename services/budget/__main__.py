from .main import main
from ..common.runner import run

run(main)
