"""Over training: the bundled tiny GPT's own training run (or a series of your checkpoints) measured at log-spaced
steps: the loss, in-context learning and every head's scores against the step, the phase change in which its
induction heads form, and any step's checkpoint opened on the other pages."""

from attnviz.ui.frame import start_page
from attnviz.ui.open_in_explore import switch_if_asked as switch_to_explore_if_asked
from attnviz.ui.open_in_generation import switch_if_asked as switch_to_generation_if_asked
from attnviz.ui.over_training_view import over_training_view


def main() -> None:
    switch_to_explore_if_asked()
    switch_to_generation_if_asked()
    start_page("Over training")
    over_training_view()


main()
